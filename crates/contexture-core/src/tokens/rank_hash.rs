//! The hash of a token's bytes that places it in its encoding's rank table. The build script
//! (which builds the tables) and the tokenizer (which looks tokens up in them) both include
//! this file, so the two cannot disagree.

/// The multiplier of FxHash (a 64-bit odd constant with well-spread bits).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// A hash of `bytes`, read eight at a time: tokens are short, so a lookup costs a few
/// multiplications.
pub fn rank_hash(bytes: &[u8]) -> u64 {
    let mut hash = bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(eight)).wrapping_mul(SEED);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut eight = [0u8; 8];
        eight[..rest.len()].copy_from_slice(rest);
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(eight)).wrapping_mul(SEED);
    }
    // The high bits are the best mixed; the table indexes by the low ones.
    hash ^ (hash >> 29)
}
