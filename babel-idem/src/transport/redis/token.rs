//! Reservation tokens without a system call each.

use std::sync::atomic::{AtomicU64, Ordering};

/// Makes reservation tokens: 32 lowercase hexadecimal characters, the shape
/// of the Python SDK's `uuid4().hex`.
///
/// A token only has to differ from every other live reservation's, so 64
/// random bits drawn once per transport and a counter are as good as a
/// fresh UUID per reservation, and cost no `getrandom` call on the hot path.
#[derive(Debug)]
pub(super) struct Tokens {
    seed: u64,
    next: AtomicU64,
}

impl Tokens {
    pub(super) fn new() -> Self {
        let (seed, start) = uuid::Uuid::new_v4().as_u64_pair();
        Tokens {
            seed,
            next: AtomicU64::new(start),
        }
    }

    pub(super) fn next(&self) -> String {
        let count = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{count:016x}", self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_32_lowercase_hex_characters_and_never_repeat() {
        let (one, other) = (Tokens::new(), Tokens::new());
        let tokens: Vec<String> = (0..1000).flat_map(|_| [one.next(), other.next()]).collect();
        for token in &tokens {
            assert_eq!(token.len(), 32, "{token}");
            assert!(
                token
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{token}"
            );
        }
        assert_eq!(tokens.iter().collect::<HashSet<_>>().len(), tokens.len());
    }
}
