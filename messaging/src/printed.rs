//! What a test's log subscriber prints, kept as text (tests only).

use std::sync::{Arc, Mutex};

/// The bytes a `tracing_subscriber::fmt` subscriber writes, shared with
/// the test that reads them.
#[derive(Clone, Default)]
pub(crate) struct Printed(Arc<Mutex<Vec<u8>>>);

impl Printed {
    /// What was printed so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// A plain-text subscriber (no colours, no times) that prints here.
    pub(crate) fn subscriber(
        &self,
    ) -> tracing_subscriber::fmt::SubscriberBuilder<
        tracing_subscriber::fmt::format::DefaultFields,
        tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full, ()>,
        tracing::level_filters::LevelFilter,
        impl for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
    > {
        let printed = self.clone();
        tracing_subscriber::fmt().with_writer(move || printed.clone()).with_ansi(false).without_time()
    }
}

impl std::io::Write for Printed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
