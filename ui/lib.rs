//! Nothing but a home for `tests/ui.rs`: the trybuild cases of the macros
//! (`tests/ui/pass` must compile and run, `tests/ui/fail` must fail with the
//! `.stderr` beside each file).
