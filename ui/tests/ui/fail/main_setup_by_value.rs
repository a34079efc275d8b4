#[messaging::main]
async fn main(setup: messaging::Setup) {
    let _ = setup;
}
