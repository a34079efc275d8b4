#[messaging::queue("orders-of-the-european-union-region-for-customers-with-a-premium-subscription-plan")]
pub struct Orders;

fn main() {}
