//! The BabelQueue conformance runner.
