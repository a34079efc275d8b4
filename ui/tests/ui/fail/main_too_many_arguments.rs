#[messaging::main]
async fn main(setup: &mut messaging::Setup, verbose: bool) {
    let _ = (setup, verbose);
}
