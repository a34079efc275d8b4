// `async fn main() {}` is a valid `#[messaging::main]`: no setup at all. It
// sits in a module so that this test does not start serving when run.
mod service {
    #[messaging::main]
    #[allow(dead_code)]
    pub async fn main() {}
}

// The hook may also take the setup and return nothing.
mod service_with_setup {
    use messaging::prelude::*;

    #[messaging::main]
    #[allow(dead_code)]
    pub async fn main(setup: &mut Setup) {
        setup.run_mode(RunMode::Drain);
    }
}

fn main() {
    let _ = (service::main, service_with_setup::main);
}
