//! Compile-time behaviour of the macros and of the publisher's type state:
//! `ui/pass` must compile (and run), `ui/fail` must fail with the `.stderr`
//! next to each file. Regenerate with `TRYBUILD=overwrite cargo test -p messaging-ui --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
