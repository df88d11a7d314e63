//! Builds each encoding's rank table from its tiktoken rank file (`data/*.tiktoken.gz`) into
//! `OUT_DIR`, for the tokenizer to read in place from the binary (see `src/tokens/ranks.rs`):
//!
//! - `<encoding>.bytes`: every token's bytes, in rank order, one after another;
//! - `<encoding>.slots`: an open-addressed hash table (linear probing, a power of two of
//!   slots, at most half full) of little-endian `u64`s, each a token's rank (the low 32
//!   bits), length in bytes (the next 8) and start in `.bytes` (the top 24), or 0 for an
//!   empty slot (no token is empty), placed by `rank_hash` of its bytes: a lookup reads its
//!   slot and, when the length matches, the token's bytes;
//! - `<encoding>.rs`: the sizes, as constants.

use std::io::Read;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

#[path = "src/tokens/rank_hash.rs"]
mod rank_hash;

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for name in ["cl100k_base", "o200k_base"] {
        let source = format!("data/{name}.tiktoken.gz");
        println!("cargo::rerun-if-changed={source}");
        build(name, Path::new(&source), Path::new(&out));
    }
    println!("cargo::rerun-if-changed=src/tokens/rank_hash.rs");
    println!("cargo::rerun-if-changed=build.rs");
}

fn build(name: &str, source: &Path, out: &Path) {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(source).expect("the rank file is there"))
        .read_to_string(&mut text)
        .expect("the rank file is gzipped UTF-8");
    let mut bytes = Vec::new();
    let mut starts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let (token, rank) = line.split_once(' ').expect("a line is `base64 rank`");
        let rank: usize = rank.parse().expect("a rank is a number");
        assert_eq!(rank, index, "{name}: ranks must run from 0 in order");
        starts.push(u32::try_from(bytes.len()).expect("under 4 GB of tokens"));
        bytes.extend(STANDARD.decode(token).expect("a token is base64"));
    }
    starts.push(u32::try_from(bytes.len()).expect("under 4 GB of tokens"));
    let tokens = starts.len() - 1;
    let token = |rank: usize| &bytes[starts[rank] as usize..starts[rank + 1] as usize];
    let slots_len = (tokens * 2).next_power_of_two();
    let mut slots = vec![0u64; slots_len];
    let mut max_len = 0;
    for (rank, &start) in starts[..tokens].iter().enumerate() {
        let piece = token(rank);
        max_len = max_len.max(piece.len());
        assert!(
            !piece.is_empty() && piece.len() < 256,
            "{name}: token {rank}'s length"
        );
        assert!(start < 1 << 24, "{name}: under 16 MB of token bytes");
        let entry = rank as u64 | (piece.len() as u64) << 32 | u64::from(start) << 40;
        let mut slot = rank_hash::rank_hash(piece) as usize & (slots_len - 1);
        while slots[slot] != 0 {
            let (start, len) = (
                (slots[slot] >> 40) as usize,
                (slots[slot] >> 32) as u8 as usize,
            );
            assert_ne!(&bytes[start..start + len], piece, "{name}: a token twice");
            slot = (slot + 1) & (slots_len - 1);
        }
        slots[slot] = entry;
    }
    // Every byte on its own is a token: any text can be encoded.
    let mut single = [false; 256];
    for rank in 0..tokens {
        if let [byte] = token(rank) {
            single[usize::from(*byte)] = true;
        }
    }
    if let Some(byte) = single.iter().position(|is_token| !is_token) {
        panic!("{name}: byte {byte} is not a token");
    }
    let slots: Vec<u8> = slots.iter().flat_map(|slot| slot.to_le_bytes()).collect();
    write(out, &format!("{name}.bytes"), &bytes);
    write(out, &format!("{name}.slots"), &slots);
    write(
        out,
        &format!("{name}.rs"),
        format!(
            "/// Slots in its hash table (a power of two).\npub const SLOTS: usize = {slots_len};\n\
             /// The longest token, in bytes.\npub const MAX_TOKEN_BYTES: usize = {max_len};\n"
        )
        .as_bytes(),
    );
}

/// Writes `contents` to `out/file` unless it already holds them (so that an unchanged table
/// does not make its crate build again).
fn write(out: &Path, file: &str, contents: &[u8]) {
    let path = out.join(file);
    if std::fs::read(&path).is_ok_and(|old| old == contents) {
        return;
    }
    std::fs::write(&path, contents).expect("OUT_DIR is writable");
}
