// A duration without a unit: the same rule as the command line and the
// connection URLs (one parser), which names the fix.
#[messaging::queue("jobs", visibility = "30")]
pub struct Jobs;

fn main() {}
