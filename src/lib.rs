//! Examples, integration tests and benchmarks of `messaging`.
