//! How a publisher compresses its samples on the wire (docs/compression.md);
//! the work itself is `engine::compress`.

pub use milonga_wire::frame::Compressor;

/// How a publisher compresses its samples (`PublisherQos::compression`,
/// or the node's `compression` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    /// What compresses (`None`: samples go as they are).
    pub compressor: Option<Compressor>,
    /// Payloads smaller than this go as they are.
    pub threshold_bytes: usize,
    /// zstd's level (1 to 22; negative levels are faster still); LZ4's
    /// acceleration when positive (1 is the default, higher is faster and
    /// compresses less).
    pub level: i32,
    /// zstd only: a dictionary per key, trained from the key's first
    /// [`DICTIONARY_TRAINING_SAMPLES`] samples at least `threshold_bytes`
    /// long (sent with plain zstd meanwhile), then sent once to each
    /// subscriber that asks for it, as a schema is, and used for every
    /// later sample (docs/compression.md, "Dictionaries"). Small
    /// messages, which compress badly alone, compress against what the
    /// key's samples have in common: lower the threshold with it.
    pub dictionary: bool,
}

/// Samples a publisher trains its dictionary from.
pub const DICTIONARY_TRAINING_SAMPLES: usize = 128;
/// Largest dictionary a publisher trains (bytes).
pub const MAX_DICTIONARY_BYTES: usize = 16 << 10;

/// The dictionary a publisher trains from its first samples: zstd's
/// trainer (`ZDICT_trainFromBuffer`) over them, at most a quarter of their
/// bytes and [`MAX_DICTIONARY_BYTES`]; when they are too few or too alike
/// for it, their latest bytes, which zstd takes as a "raw content"
/// dictionary (empty only if the samples are). Public so that benchmarks
/// train as publishers do.
pub fn train_dictionary(samples: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = samples.iter().map(Vec::len).sum();
    let capacity = (total / 4).clamp(256, MAX_DICTIONARY_BYTES);
    match zstd::dict::from_samples(samples, capacity) {
        Ok(d) if !d.is_empty() => d,
        _ => {
            // The latest samples whole, as many as fit; at least the end
            // of the latest one.
            let mut raw = Vec::new();
            for s in samples.iter().rev() {
                if raw.len() + s.len() > MAX_DICTIONARY_BYTES {
                    if raw.is_empty() {
                        raw.extend_from_slice(&s[s.len() - MAX_DICTIONARY_BYTES..]);
                    }
                    break;
                }
                raw.splice(0..0, s.iter().copied());
            }
            raw
        }
    }
}

/// The threshold a compressor starts at unless told.
pub const DEFAULT_THRESHOLD_BYTES: usize = 512;
/// zstd's level unless told.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

impl Default for Compression {
    fn default() -> Self {
        Compression::none()
    }
}

impl Compression {
    /// No compression.
    pub fn none() -> Self {
        Compression {
            compressor: None,
            threshold_bytes: DEFAULT_THRESHOLD_BYTES,
            level: DEFAULT_ZSTD_LEVEL,
            dictionary: false,
        }
    }

    /// LZ4 (fast, less compression), from 512 bytes.
    pub fn lz4() -> Self {
        Compression {
            compressor: Some(Compressor::Lz4),
            level: 1,
            ..Compression::none()
        }
    }

    /// Zstandard at level 3, from 512 bytes.
    pub fn zstd() -> Self {
        Compression {
            compressor: Some(Compressor::Zstd),
            ..Compression::none()
        }
    }

    /// Compresses only payloads of at least `bytes`.
    pub fn threshold(mut self, bytes: usize) -> Self {
        self.threshold_bytes = bytes;
        self
    }

    /// zstd with a dictionary per key (see
    /// [`Compression::dictionary`](Compression#structfield.dictionary));
    /// no effect on LZ4.
    pub fn dictionary(mut self) -> Self {
        self.dictionary = true;
        self
    }

    /// Sets the level (zstd) or acceleration (LZ4).
    pub fn level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// The name used in configuration: `none`, `lz4` or `zstd`.
    pub fn name(&self) -> &'static str {
        match self.compressor {
            None => "none",
            Some(Compressor::Lz4) => "lz4",
            Some(Compressor::Zstd) => "zstd",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the samples, the dictionary is at most 16 KiB and never
    /// empty: samples larger than that (the trainer fails on 128 copies of
    /// one) give the end of the latest.
    #[test]
    fn a_dictionary_is_bounded_and_not_empty() {
        let mut x: u32 = 7;
        let big: Vec<u8> = (0..20_000)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            })
            .collect();
        let same = vec![big.clone(); DICTIONARY_TRAINING_SAMPLES];
        let d = train_dictionary(&same);
        assert!(
            !d.is_empty() && d.len() <= MAX_DICTIONARY_BYTES,
            "{}",
            d.len()
        );
        let small: Vec<Vec<u8>> = (0..DICTIONARY_TRAINING_SAMPLES)
            .map(|i| format!("beam {i}: current 12.{i} mA, state ON").into_bytes())
            .collect();
        let d = train_dictionary(&small);
        assert!(
            !d.is_empty() && d.len() <= MAX_DICTIONARY_BYTES,
            "{}",
            d.len()
        );
    }
}
