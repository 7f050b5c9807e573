//! Every row of the contract table (DESIGN section 1), through `guard`.
