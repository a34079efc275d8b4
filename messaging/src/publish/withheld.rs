//! Sends that a command other than `run` does not make.
//!
//! `validate`, `console`, `outbox` and `schedules` run the app's `main` to
//! see its setup (the states handlers take, an outbox, schedules' ledger).
//! A `main` that publishes (the quick start's does) would publish again at
//! every such command: an operator checking a deployment or opening the
//! console sent the setup's messages (found from outside, with `validate`).
//! The publishers of such a setup check and encode each message as a send
//! does, then count it here instead of sending it.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The sends withheld, per queue.
#[derive(Debug, Default)]
pub(crate) struct Withheld {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Withheld {
    /// Counts `n` messages for `queue`, not sent.
    pub(crate) fn record(&self, queue: &'static str, n: usize) {
        if n == 0 {
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(queue).or_default() += n as u64;
    }

    /// What was withheld, as a sentence for `command`'s user; `None` when
    /// nothing was.
    pub(crate) fn summary(&self, command: &str) -> Option<String> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.is_empty() {
            return None;
        }
        let total: u64 = counts.values().sum();
        let queues: Vec<String> = counts.iter().map(|(queue, n)| format!("{n} to `{queue}`")).collect();
        Some(format!(
            "main published {total} message(s) ({}) while setting up; `{command}` sends nothing, so none was sent \
             (only `run` publishes what main sends)",
            queues.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::Withheld;

    #[test]
    fn the_summary_names_each_queue_and_the_command() {
        let withheld = Withheld::default();
        assert_eq!(withheld.summary("validate"), None);
        withheld.record("orders", 2);
        withheld.record("mails", 1);
        withheld.record("orders", 0);
        withheld.record("orders", 1);
        assert_eq!(
            withheld.summary("validate").unwrap(),
            "main published 4 message(s) (1 to `mails`, 3 to `orders`) while setting up; `validate` sends nothing, \
             so none was sent (only `run` publishes what main sends)"
        );
    }
}
