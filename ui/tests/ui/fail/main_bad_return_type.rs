#[messaging::main]
async fn main(setup: &mut messaging::Setup) -> u8 {
    let _ = setup;
    0
}
