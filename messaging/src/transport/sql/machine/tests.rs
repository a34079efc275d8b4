//! One test per row of the transition table of database queues.

use super::*;

const LEASE: i64 = 1_000;

fn queue(rules: QueueRules) -> IdentityQueue {
    IdentityQueue::new(rules)
}

fn msg(identity: Option<&str>, payload: &str) -> Enqueue {
    Enqueue::test(&format!("m-{payload}"), identity, payload)
}

fn status(q: &IdentityQueue, id: RowId) -> Status {
    q.row(id).expect("row exists").status
}

fn payload(q: &IdentityQueue, id: RowId) -> String {
    String::from_utf8(q.row(id).expect("row exists").payload.clone()).expect("utf8")
}

#[test]
fn enqueue_without_identity_always_inserts() {
    let mut q = queue(QueueRules::default());
    let a = q.enqueue(0, msg(None, "x"));
    let b = q.enqueue(0, msg(None, "x"));
    assert!(matches!(a, EnqueueOutcome::Inserted(_)) && matches!(b, EnqueueOutcome::Inserted(_)));
    assert_ne!(a.row().expect("a row"), b.row().expect("a row"));
    let later = q.enqueue(0, Enqueue { process_at: Some(500), ..msg(None, "later") });
    assert_eq!(status(&q, later.row().expect("a row")), Status::Sleeping);
}

#[test]
fn at_most_one_row_per_identity_whatever_its_status() {
    for terminal in [Status::Pending, Status::Sleeping, Status::Error, Status::Processed] {
        let mut q = queue(QueueRules { retention_ms: 10_000, max_attempts: 1, ..QueueRules::default() });
        let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
        match terminal {
            Status::Sleeping => {
                q.enqueue(0, Enqueue { process_at: Some(50), ..msg(Some("k"), "v1b") });
            }
            Status::Error => {
                let l = q.lease(0, 1, LEASE).remove(0);
                q.fail(1, id, l.token, 2, "boom").unwrap();
            }
            Status::Processed => {
                let l = q.lease(0, 1, LEASE).remove(0);
                q.complete(1, id, l.token).unwrap();
            }
            _ => {}
        }
        assert_eq!(status(&q, id), terminal);
        let out = q.enqueue(5, msg(Some("k"), "v2"));
        assert_eq!(out, EnqueueOutcome::Updated(id), "from {terminal:?}");
        assert_eq!(status(&q, id), Status::Pending, "Error → Pending too");
        assert_eq!(payload(&q, id), "v2");
        assert_eq!(q.row(id).unwrap().attempts, 0, "attempts reset");
        assert_eq!(q.rows().count(), 1);
    }
}

#[test]
fn idempotent_queues_discard_an_unchanged_payload() {
    let mut q = queue(QueueRules { idempotent: true, ..QueueRules::default() });
    let id = q.enqueue(0, msg(Some("k"), "same")).row().expect("a row");
    assert_eq!(q.enqueue(1, msg(Some("k"), "same")), EnqueueOutcome::Discarded(id));
    assert_eq!(q.enqueue(1, msg(Some("k"), "changed")), EnqueueOutcome::Updated(id));
    // In AwaitingRelease the newest version is the deferred one.
    let l = q.lease(2, 1, LEASE).remove(0);
    assert_eq!(q.enqueue(3, msg(Some("k"), "changed")), EnqueueOutcome::Discarded(id), "equals the leased version");
    assert_eq!(q.enqueue(3, msg(Some("k"), "v3")), EnqueueOutcome::Deferred(id));
    assert_eq!(q.enqueue(4, msg(Some("k"), "v3")), EnqueueOutcome::Discarded(id), "equals the deferred version");
    assert_eq!(q.enqueue(4, msg(Some("k"), "changed")), EnqueueOutcome::Deferred(id), "differs from the deferred one");
    q.complete(5, id, l.token).unwrap();
    assert_eq!(payload(&q, id), "changed");
}

#[test]
fn idempotent_queues_remember_the_processed_version_after_its_row_is_gone() {
    let mut q = queue(QueueRules { idempotent: true, ..QueueRules::default() });
    let id = q.enqueue(0, msg(Some("k"), "nightly")).row().expect("a row");
    let l = q.lease(1, 1, LEASE).remove(0);
    q.complete(2, id, l.token).unwrap();
    assert!(q.row(id).is_none(), "retention 0 deletes the processed row");
    assert_eq!(q.enqueue(3, msg(Some("k"), "nightly")), EnqueueOutcome::Unchanged, "the same export again");
    assert_eq!(q.rows().count(), 0);
    assert!(matches!(q.enqueue(4, msg(Some("k"), "changed")), EnqueueOutcome::Inserted(_)), "a change runs");
    // Without the idempotent flag the same version runs again.
    let mut plain = queue(QueueRules::default());
    let id = plain.enqueue(0, msg(Some("k"), "nightly")).row().expect("a row");
    let l = plain.lease(1, 1, LEASE).remove(0);
    plain.complete(2, id, l.token).unwrap();
    assert!(matches!(plain.enqueue(3, msg(Some("k"), "nightly")), EnqueueOutcome::Inserted(_)));
}

#[test]
fn enqueue_while_leased_defers_the_new_version() {
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    let deferred = Enqueue { priority: 7, process_at: Some(100), ..msg(Some("k"), "v2") };
    assert_eq!(q.enqueue(10, deferred), EnqueueOutcome::Deferred(id));
    assert_eq!(status(&q, id), Status::AwaitingRelease);
    assert_eq!(payload(&q, id), "v1", "the lease holder keeps its version");
    assert!(q.lease(20, 10, LEASE).is_empty(), "nobody else can lease the newer version");
    // A later enqueue replaces the deferred values.
    assert_eq!(q.enqueue(30, msg(Some("k"), "v3")), EnqueueOutcome::Deferred(id));
    assert_eq!(q.row(id).unwrap().deferred.as_ref().unwrap().payload, b"v3");
    assert_eq!(q.row(id).unwrap().deferred.as_ref().unwrap().priority, 0);
    q.complete(40, id, l.token).unwrap();
    assert_eq!(status(&q, id), Status::Pending);
    assert_eq!(payload(&q, id), "v3");
    assert_eq!(q.previous("k"), Some(&b"v1"[..]), "the processed version is the previous message");
    let again = q.lease(50, 1, LEASE).remove(0);
    assert_eq!(again.payload, b"v3");
    assert_eq!(again.attempts, 1, "the new version starts its own attempts");
}

#[test]
fn deferred_destinations_future_due_and_custom() {
    for (process_at, custom, release_at, expected) in [
        (Some(1_000), None, 10, Status::Sleeping),
        (Some(5), None, 10, Status::Pending),
        (None, Some(Status::Error), 10, Status::Error),
    ] {
        let mut q = queue(QueueRules::default());
        let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
        let l = q.lease(0, 1, LEASE).remove(0);
        q.enqueue(1, Enqueue { process_at, status: custom, ..msg(Some("k"), "v2") });
        q.release(release_at, id, l.token).unwrap();
        assert_eq!(status(&q, id), expected, "{process_at:?} {custom:?}");
    }
}

#[test]
fn the_old_processors_failure_never_overwrites_the_newer_enqueue() {
    let mut q = queue(QueueRules { max_attempts: 1, ..QueueRules::default() });
    let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.enqueue(1, msg(Some("k"), "v2"));
    q.fail(2, id, l.token, 500, "old attempt failed").unwrap();
    assert_eq!(status(&q, id), Status::Pending, "not Error: the newer version applies");
    assert_eq!(payload(&q, id), "v2");
    assert_eq!(q.row(id).unwrap().error, None);
    let l = q.lease(3, 1, LEASE).remove(0);
    q.enqueue(4, msg(Some("k"), "v3"));
    q.dead_letter(5, id, l.token, "permanent").unwrap();
    assert_eq!((status(&q, id), payload(&q, id).as_str()), (Status::Pending, "v3"));
}

#[test]
fn complete_keeps_or_deletes_by_retention_and_records_previous() {
    let mut q = queue(QueueRules { retention_ms: 0, ..QueueRules::default() });
    let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.complete(1, id, l.token).unwrap();
    assert!(q.row(id).is_none(), "retention 0 deletes");
    assert_eq!(q.previous("k"), Some(&b"v1"[..]), "…but the previous version is recorded");
    assert!(matches!(q.enqueue(2, msg(Some("k"), "v2")), EnqueueOutcome::Inserted(_)));

    let mut q = queue(QueueRules { retention_ms: 100, ..QueueRules::default() });
    let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.complete(10, id, l.token).unwrap();
    assert_eq!(status(&q, id), Status::Processed);
    assert_eq!(q.purge(109), 0);
    assert_eq!(q.purge(110), 1);
    assert!(q.by_identity("k").is_none());
}

#[test]
fn fail_backs_off_then_dead_letters() {
    let mut q = queue(QueueRules { max_attempts: 2, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.fail(1, id, l.token, 100, "first").unwrap();
    assert_eq!(status(&q, id), Status::Sleeping);
    assert!(q.lease(99, 1, LEASE).is_empty(), "backing off");
    let l = q.lease(100, 1, LEASE).remove(0);
    assert_eq!(l.attempts, 2);
    q.fail(101, id, l.token, 200, "second").unwrap();
    assert_eq!(status(&q, id), Status::Error);
    assert_eq!(q.row(id).unwrap().error.as_deref(), Some("second (after 2 attempts)"));
    let history: Vec<(u32, i64, String)> =
        q.row(id).unwrap().history.iter().map(|a| (a.attempt, a.at_ms, a.message.clone())).collect();
    assert_eq!(
        history,
        [(1, 1, "first".to_owned()), (2, 101, "second".to_owned())],
        "each failure, when, and which attempt"
    );
    assert!(q.redrive(id));
    assert_eq!((status(&q, id), q.row(id).unwrap().attempts), (Status::Pending, 0));
}

#[test]
fn release_charges_no_attempt() {
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.release(1, id, l.token).unwrap();
    assert_eq!((status(&q, id), q.row(id).unwrap().attempts), (Status::Pending, 0));
}

#[test]
fn postpone_charges_no_attempt_and_sleeps_until_its_time() {
    let mut q = queue(QueueRules { max_attempts: 1, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    // More postponements than attempts: none of them counts.
    for round in 0..3 {
        let now = round * 1_000;
        let l = q.lease(now, 1, LEASE).remove(0);
        q.postpone(now + 1, id, l.token, now + 500, "waiting for a newer build").unwrap();
        let row = q.row(id).unwrap();
        assert_eq!((row.status, row.attempts, row.process_at), (Status::Sleeping, 0, Some(now + 500)));
        assert!(row.history.is_empty(), "a postponement is not a failed attempt");
        assert_eq!(row.error.as_deref(), Some("waiting for a newer build"), "what `show` says of it");
        assert!(q.lease(now + 499, 1, LEASE).is_empty(), "not leased before its time");
    }
    // A stale token is refused, as for every other settlement.
    let l = q.lease(5_000, 1, LEASE).remove(0);
    q.release(5_001, id, l.token).unwrap();
    assert!(q.postpone(5_002, id, l.token, 6_000, "late").is_err());
}

#[test]
fn lease_expiry_is_abandonment() {
    let mut q = queue(QueueRules { retry_abandoned: true, max_attempts: 2, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    q.lease(0, 1, LEASE);
    assert_eq!(q.expire(LEASE), vec![id]);
    let row = q.row(id).unwrap();
    assert_eq!(
        (row.status, row.attempts, row.suspect),
        (Status::Pending, 0, Suspect::Once),
        "not run alone: given back, and handled as usual next"
    );
    // Its lease runs out again: given back again, and a suspect now.
    let l = q.lease(LEASE, 1, LEASE).remove(0);
    assert_eq!((l.attempts, l.suspect), (1, Suspect::Once));
    assert_eq!(q.expire(2 * LEASE), vec![id]);
    let row = q.row(id).unwrap();
    assert_eq!((row.status, row.attempts, row.suspect), (Status::Pending, 0, Suspect::Yes));
    for round in 2..=3 {
        let l = q.lease(round * LEASE, 1, LEASE).remove(0);
        assert_eq!((l.attempts, l.suspect), (round as u32 - 1, Suspect::Yes));
        q.isolate(id, l.token).unwrap();
        q.expire((round + 1) * LEASE);
    }
    let row = q.row(id).unwrap();
    assert_eq!((row.status, row.attempts), (Status::Error, 2), "out of attempts, each run alone");

    let mut q = queue(QueueRules { retry_abandoned: false, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    q.lease(0, 1, LEASE);
    q.expire(LEASE);
    assert_eq!(status(&q, id), Status::Error);

    // AwaitingRelease: the deferred values apply as on release.
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(Some("k"), "v1")).row().expect("a row");
    q.lease(0, 1, LEASE);
    q.enqueue(1, msg(Some("k"), "v2"));
    q.expire(LEASE);
    assert_eq!((status(&q, id), payload(&q, id).as_str()), (Status::Pending, "v2"));
}

#[test]
fn stale_tokens_are_fenced() {
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let first = q.lease(0, 1, LEASE).remove(0);
    // The lease expires and another processor takes the message.
    let second = q.lease(LEASE, 1, LEASE).remove(0);
    assert_ne!(first.token, second.token);
    assert_eq!(q.complete(LEASE + 1, id, first.token), Err(LeaseLost));
    assert_eq!(q.fail(LEASE + 1, id, first.token, 0, "late"), Err(LeaseLost));
    assert_eq!(q.release(LEASE + 1, id, first.token), Err(LeaseLost));
    assert_eq!(q.extend(LEASE + 1, id, first.token, LEASE), Err(LeaseLost));
    assert_eq!(status(&q, id), Status::Processing, "no change");
    // An expired lease holds until it is taken back: nothing else can have
    // the message meanwhile, so a late outcome settles it.
    q.extend(2 * LEASE + 1, id, second.token, LEASE).expect("extended once its time ran out");
    assert!(q.expire(3 * LEASE + 1).contains(&id), "taken back once the extension ran out");
    assert_eq!(q.complete(3 * LEASE + 2, id, second.token), Err(LeaseLost), "taken back, it is lost");
    let third = q.lease(3 * LEASE + 3, 1, LEASE).remove(0);
    q.complete(5 * LEASE, id, third.token).expect("a late acknowledgement of a lease nobody took back");
    assert!(q.row(id).is_none(), "completed");
}

#[test]
fn extend_pushes_the_expiry_out() {
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(Some("k"), "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.extend(900, id, l.token, LEASE).unwrap();
    assert!(q.expire(1_500).is_empty());
    q.enqueue(1_600, msg(Some("k"), "y"));
    q.extend(1_800, id, l.token, LEASE).unwrap();
    assert_eq!(q.row(id).unwrap().lease_expires, Some(2_800), "AwaitingRelease extends too");
}

#[test]
fn leasing_order_is_priority_then_enqueue_order() {
    let mut q = queue(QueueRules::default());
    let low = q.enqueue(0, msg(None, "low")).row().expect("a row");
    let high = q.enqueue(1, Enqueue { priority: 5, ..msg(None, "high") }).row().expect("a row");
    let low2 = q.enqueue(2, msg(None, "low2")).row().expect("a row");
    let due = q.enqueue(3, Enqueue { process_at: Some(10), priority: 9, ..msg(None, "sleeper") }).row().expect("a row");
    let order: Vec<RowId> = q.lease(5, 10, LEASE).into_iter().map(|l| l.id).collect();
    assert_eq!(order, vec![high, low, low2], "the sleeper is not due yet");
    assert_eq!(q.lease(10, 10, LEASE).remove(0).id, due);
}

#[test]
fn fifo_groups_lease_one_at_a_time_in_order() {
    let mut q = queue(QueueRules { fifo: true, ..QueueRules::default() });
    let g = |p: &str, group: &str| Enqueue { group: Some(group.into()), ..msg(None, p) };
    let a1 = q.enqueue(0, g("a1", "a")).row().expect("a row");
    let a2 = q.enqueue(1, g("a2", "a")).row().expect("a row");
    let b1 = q.enqueue(2, g("b1", "b")).row().expect("a row");
    let first: Vec<RowId> = q.lease(3, 10, LEASE).into_iter().map(|l| l.id).collect();
    assert_eq!(first, vec![a1, b1]);
    assert!(q.lease(4, 10, LEASE).is_empty(), "both groups are busy");
    let token = q.row(a1).unwrap().lease_token.unwrap();
    q.fail(5, a1, token, 50, "retry").unwrap();
    assert!(q.lease(6, 10, LEASE).is_empty(), "a2 waits for a1's retry");
    assert_eq!(q.lease(50, 10, LEASE).remove(0).id, a1);
    let token = q.row(a1).unwrap().lease_token.unwrap();
    q.complete(51, a1, token).unwrap();
    assert_eq!(q.lease(52, 10, LEASE).remove(0).id, a2);
}

#[test]
fn a_failure_counts_the_attempts_made_within_one_lease() {
    // A FIFO head is tried again in process without a new lease: the worker's
    // attempt number is the one recorded, and the reason says it.
    let mut q = queue(QueueRules { max_attempts: 2, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    let failure = crate::transport::FailedAttempt::new(2, "Error", "still failing");
    let mut row = q.row(id).unwrap().clone();
    row.dead_letter(1, l.token, &failure).unwrap();
    assert_eq!(row.error.as_deref(), Some("still failing (after 2 attempts)"));
    assert_eq!(row.history.iter().map(|a| a.attempt).collect::<Vec<_>>(), [2]);
}

#[test]
fn an_attempt_retried_within_its_lease_is_noted_and_the_lease_stays() {
    // The FIFO head's earlier attempts are written down as they fail, so the
    // dead letter shows each one, and the row stays leased meanwhile.
    let mut q = queue(QueueRules { max_attempts: 3, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    let mut row = q.row(id).unwrap().clone();
    let failed = |attempt, message| crate::transport::FailedAttempt::new(attempt, "Error", message);
    row.note(5, l.token, &failed(1, "first")).unwrap();
    row.note(9, l.token, &failed(2, "second")).unwrap();
    assert_eq!((row.status, row.lease_token), (Status::Processing, Some(l.token)), "still held");
    assert_eq!(row.attempts, 3, "the next try charged, as a lease charges its first");
    assert_eq!(row.lease_expires, Some(LEASE));
    assert_eq!(row.error.as_deref(), Some("second (after 2 attempts)"), "the last error so far");
    row.dead_letter(12, l.token, &failed(3, "third")).unwrap();
    let history: Vec<(u32, i64)> = row.history.iter().map(|a| (a.attempt, a.at_ms)).collect();
    assert_eq!(history, [(1, 5), (2, 9), (3, 12)]);
    assert_eq!(row.note(13, l.token, &failed(4, "late")), Err(LeaseLost), "no lease, no note");
}

#[test]
fn a_release_keeps_the_attempts_its_holder_noted_as_failed() {
    // The worker stops while a FIFO head waits for its retry in process: the
    // release gives back only the try not made, and the next lease's attempt
    // is numbered after the failed ones.
    let mut q = queue(QueueRules { max_attempts: 5, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    let l = q.lease(0, 1, LEASE).remove(0);
    q.note(1, id, l.token, "first").unwrap();
    q.release(2, id, l.token).unwrap();
    assert_eq!((status(&q, id), q.row(id).unwrap().attempts), (Status::Pending, 1), "attempt 1 stays spent");
    let l = q.lease(3, 1, LEASE).remove(0);
    assert_eq!(l.attempts, 2);
    let mut row = q.row(id).unwrap().clone();
    row.note(4, l.token, &crate::transport::FailedAttempt::new(2, "Error", "second")).unwrap();
    row.note(5, l.token, &crate::transport::FailedAttempt::new(3, "Error", "third")).unwrap();
    row.release(6, l.token).unwrap();
    assert_eq!(row.attempts, 3, "two tries under the second lease");
    // A redriven letter starts again from nothing, whatever its history says.
    let mut q = queue(QueueRules { max_attempts: 2, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    for at in [0, 100] {
        let l = q.lease(at, 1, LEASE).remove(0);
        q.fail(at + 1, id, l.token, at + 100, "failed").unwrap();
    }
    assert_eq!(status(&q, id), Status::Error);
    assert!(q.redrive(id));
    let l = q.lease(300, 1, LEASE).remove(0);
    q.release(301, id, l.token).unwrap();
    assert_eq!((status(&q, id), q.row(id).unwrap().attempts), (Status::Pending, 0));
}

#[test]
fn a_suspect_s_mark_lasts_until_its_handler_answers() {
    let mut q = queue(QueueRules::default());
    let id = q.enqueue(0, msg(None, "x")).row().expect("a row");
    // Once: a release keeps the mark, a second lease that runs out makes
    // it a suspect.
    q.lease(0, 1, LEASE);
    q.expire(LEASE);
    let l = q.lease(LEASE, 1, LEASE).remove(0);
    q.release(LEASE + 1, id, l.token).unwrap();
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Once);
    q.lease(LEASE + 1, 1, LEASE);
    q.expire(2 * LEASE + 1);
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Yes);
    let now = 2 * LEASE + 1;
    // A release (shutdown) keeps it a suspect, and one that ran alone goes
    // back to a plain suspect: it never ran.
    let l = q.lease(now, 1, LEASE).remove(0);
    q.isolate(id, l.token).unwrap();
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Alone);
    q.release(now + 1, id, l.token).unwrap();
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Yes);
    // A recorded failure is an answer.
    let l = q.lease(now + 2, 1, LEASE).remove(0);
    q.isolate(id, l.token).unwrap();
    q.fail(now + 3, id, l.token, now + 3, "declined").unwrap();
    let row = q.row(id).unwrap();
    assert_eq!((row.status, row.suspect, row.attempts), (Status::Pending, Suspect::No, 1));
    // A stale token cannot mark it.
    assert_eq!(q.isolate(id, l.token), Err(LeaseLost));
    // An answer clears the first mark too.
    q.lease(now + 5, 1, LEASE);
    q.expire(now + 5 + LEASE);
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Once);
    let l = q.lease(now + 6 + LEASE, 1, LEASE).remove(0);
    q.fail(now + 7 + LEASE, id, l.token, now + 7 + LEASE, "declined").unwrap();
    assert_eq!(q.row(id).unwrap().suspect, Suspect::No);
}

/// A suspect marked as running alone whose handler did not run after all
/// (its idempotency claim held elsewhere) is unmarked while its worker
/// keeps it: a crash then is not counted against it, and it stays a
/// suspect.
#[test]
fn a_suspect_taken_back_from_running_alone_is_not_charged_for_a_crash() {
    let mut q = queue(QueueRules { max_attempts: 3, ..QueueRules::default() });
    let id = q.enqueue(0, msg(None, "waits")).row().expect("a row");
    let mut now = 0;
    for _ in 0..2 {
        q.lease(now, 1, LEASE);
        now += LEASE;
        q.expire(now);
    }
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Yes);
    let l = q.lease(now, 1, LEASE).remove(0);
    q.isolate(id, l.token).unwrap();
    q.rejoin(id, l.token).unwrap();
    let row = q.row(id).unwrap();
    assert_eq!((row.status, row.suspect), (Status::Processing, Suspect::Yes), "still held, a suspect");
    q.expire(now + LEASE);
    let row = q.row(id).unwrap();
    assert_eq!((row.status, row.suspect, row.attempts), (Status::Pending, Suspect::Yes, 0), "not charged");
    // Marked again and then lost, it is charged.
    let l = q.lease(now + LEASE, 1, LEASE).remove(0);
    q.isolate(id, l.token).unwrap();
    q.expire(now + 2 * LEASE);
    assert_eq!(q.row(id).unwrap().attempts, 1, "charged");
    // Only the lease's holder can take the mark back; a plain lease keeps its mark.
    let l = q.lease(now + 2 * LEASE, 1, LEASE).remove(0);
    assert_eq!(q.rejoin(id, l.token + 1), Err(LeaseLost));
    q.rejoin(id, l.token).unwrap();
    assert_eq!(q.row(id).unwrap().suspect, Suspect::Yes);
}

/// The case the mark exists for: a message that stops its process each
/// time it runs, leased with three others. The crash gives every attempt
/// back; run alone, the others complete and the culprit alone spends its
/// attempts and becomes a dead letter.
#[test]
fn a_message_that_stops_its_process_spends_only_its_own_attempts() {
    let mut q = queue(QueueRules { max_attempts: 3, ..QueueRules::default() });
    let ids: Vec<RowId> =
        ["poison", "a", "b", "c"].iter().map(|p| q.enqueue(0, msg(None, p)).row().expect("a row")).collect();
    let mut now = 0;
    // Three crashes while all four are held: nothing is counted.
    for _ in 0..3 {
        assert_eq!(q.lease(now, 4, LEASE).len(), 4);
        now += LEASE;
        q.expire(now);
    }
    assert!(q.rows().all(|r| r.status == Status::Pending && r.attempts == 0 && r.suspect == Suspect::Yes));
    // Then each runs alone; the poison stops the process every time.
    while let Some(l) = q.lease(now, 1, LEASE).pop() {
        assert_eq!(l.suspect, Suspect::Yes);
        q.isolate(l.id, l.token).unwrap();
        if l.id == ids[0] {
            now += LEASE;
            q.expire(now);
        } else {
            q.complete(now, l.id, l.token).unwrap();
        }
    }
    let left: Vec<(RowId, Status, u32)> = q.rows().map(|r| (r.id, r.status, r.attempts)).collect();
    assert_eq!(left, [(ids[0], Status::Error, 3)], "only the poison is left, a dead letter after its own 3");
}
