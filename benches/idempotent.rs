//! Placeholder: replaced by the benchmark of this name.
fn main() {}
