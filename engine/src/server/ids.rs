//! Ids a client is handed for things it may come back to (a stored response): 128 random bits
//! from the operating system, so no client can guess another's.

/// `{prefix}-` and 32 lowercase hex digits of the system's randomness.
pub fn random_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    // The OS source cannot fail on the platforms Perch runs on; if it ever did, a sequential
    // id would be the unsafe fallback, so this refuses to make one instead.
    getrandom::fill(&mut bytes).expect("the system's random source failed");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits() {
        let a = random_id("resp");
        let b = random_id("resp");
        assert_ne!(a, b);
        let hex = a.strip_prefix("resp-").unwrap();
        assert_eq!(hex.len(), 32);
        assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
