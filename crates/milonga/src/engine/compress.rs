//! Compressed bodies (docs/protocol.md §4, docs/compression.md): a
//! publisher deflates a sample's payload when it is large enough and
//! shrinks; a subscriber inflates it before anything else reads it, within
//! the node's `max_message_bytes`.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

#[cfg(doc)]
use crate::model::compression::train_dictionary;
use crate::model::compression::{
    Compression, Compressor, DICTIONARY_TRAINING_SAMPLES, MAX_DICTIONARY_BYTES,
};
use milonga_wire::frame::{Compressed, COMPRESSED_HEAD_LEN, DICTIONARY_HEAD_LEN};
use milonga_wire::Bytes;
use zstd::zstd_safe;

impl Compression {
    /// The compressed body for `payload` (`compressor | size | data`), if
    /// this compresses it and it comes out smaller.
    pub(crate) fn deflate(&self, payload: &[&[u8]]) -> Option<Vec<u8>> {
        let c = self.compressor?;
        let size: usize = payload.iter().map(|p| p.len()).sum();
        if size < self.threshold_bytes.max(1) {
            return None;
        }
        let size32 = u32::try_from(size).ok()?;
        let input = contiguous(payload);
        let data = match c {
            Compressor::Lz4 => lz4::block::compress(
                &input,
                Some(lz4::block::CompressionMode::FAST(self.level.max(1))),
                false,
            )
            .ok()?,
            Compressor::Zstd => ZSTD.with(|z| {
                let mut z = z.borrow_mut();
                let i = match z.iter().position(|(l, _)| *l == self.level) {
                    Some(i) => i,
                    None => {
                        // A few levels in use on a thread: the least
                        // recently made goes.
                        if z.len() >= MAX_ZSTD_LEVELS {
                            z.remove(0);
                        }
                        z.push((self.level, zstd::bulk::Compressor::new(self.level).ok()?));
                        z.len() - 1
                    }
                };
                z[i].1.compress(&input).ok()
            })?,
        };
        if data.len() + COMPRESSED_HEAD_LEN >= size {
            return None;
        }
        let mut body = Vec::with_capacity(COMPRESSED_HEAD_LEN + data.len());
        body.extend_from_slice(&Compressed::head(c, size32));
        body.extend_from_slice(&data);
        Some(body)
    }
}

/// A publisher's zstd dictionary (`Compression::dictionary`, docs/
/// compression.md "Dictionaries"): its first samples are kept to train it
/// (and sent with plain zstd), then every sample is compressed with it.
pub(crate) struct Dictionary(Mutex<Training>);

enum Training {
    /// The samples kept so far.
    Learning(Vec<Vec<u8>>),
    Ready(Arc<Trained>),
    /// zstd could not prepare it: plain zstd from then on.
    Off,
}

/// A trained dictionary: its id (the content id of its bytes), its bytes
/// (sent to subscribers that ask), and the prepared form zstd compresses
/// with.
pub(crate) struct Trained {
    pub(crate) id: u32,
    pub(crate) bytes: Bytes,
    cdict: zstd_safe::CDict<'static>,
}

impl Default for Dictionary {
    fn default() -> Self {
        Dictionary(Mutex::new(Training::Learning(Vec::new())))
    }
}

impl Dictionary {
    /// The compressed body for `payload`, as [`Compression::deflate`]
    /// makes it, with the dictionary once it is trained; and the
    /// dictionary whenever the body was made with it (the caller makes
    /// sure its socket keeps it, for the queries that ask, before sending
    /// the body: a concurrent put may send first the body of the put that
    /// trained it, and a socket may have forgotten it).
    pub(crate) fn deflate(
        &self,
        c: &Compression,
        payload: &[&[u8]],
    ) -> (Option<Vec<u8>>, Option<Arc<Trained>>) {
        let size: usize = payload.iter().map(|p| p.len()).sum();
        if size < c.threshold_bytes.max(1) || c.compressor != Some(Compressor::Zstd) {
            return (c.deflate(payload), None);
        }
        let Ok(size32) = u32::try_from(size) else {
            return (None, None);
        };
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let trained = match &mut *st {
            Training::Ready(t) => t.clone(),
            Training::Off => {
                drop(st);
                return (c.deflate(payload), None);
            }
            Training::Learning(samples) => {
                // A dictionary holds at most 16 KiB: so much of each
                // sample trains it (and bounds what is kept meanwhile).
                let mut kept = Vec::with_capacity(size.min(MAX_DICTIONARY_BYTES));
                for p in payload {
                    let room = MAX_DICTIONARY_BYTES - kept.len();
                    kept.extend_from_slice(&p[..p.len().min(room)]);
                }
                samples.push(kept);
                if samples.len() < DICTIONARY_TRAINING_SAMPLES {
                    drop(st);
                    return (c.deflate(payload), None);
                }
                let Some(t) = train(samples, c.level) else {
                    tracing::warn!(
                        "zstd could not prepare a trained dictionary; compressing without"
                    );
                    *st = Training::Off;
                    drop(st);
                    return (c.deflate(payload), None);
                };
                let t = Arc::new(t);
                *st = Training::Ready(t.clone());
                t
            }
        };
        drop(st);
        let input = contiguous(payload);
        let mut data = Vec::with_capacity(zstd_safe::compress_bound(input.len()));
        let done = CZSTD.with(|z| {
            let mut z = z.borrow_mut();
            let cx = z.get_or_insert_with(zstd_safe::CCtx::create);
            cx.compress_using_cdict(&mut data, &input, &trained.cdict)
                .is_ok()
        });
        if !done || data.len() + DICTIONARY_HEAD_LEN >= size {
            return (None, None);
        }
        let mut body = Vec::with_capacity(DICTIONARY_HEAD_LEN + data.len());
        body.extend_from_slice(&Compressed::dictionary_head(size32, trained.id));
        body.extend_from_slice(&data);
        (Some(body), Some(trained))
    }
}

/// The dictionary trained from `samples` ([`train_dictionary`]),
/// prepared at `level`.
fn train(samples: &[Vec<u8>], level: i32) -> Option<Trained> {
    let bytes = crate::model::compression::train_dictionary(samples);
    if bytes.is_empty() {
        return None;
    }
    Some(Trained {
        id: milonga_wire::content_id(&bytes),
        cdict: zstd_safe::CDict::try_create(&bytes, level)?,
        bytes: Bytes::from(bytes),
    })
}

/// A subscriber's copy of a publisher's dictionary, prepared for
/// inflating.
pub(crate) struct Learned(zstd_safe::DDict<'static>);

impl Learned {
    /// The dictionary `bytes`, unless they are more than a publisher sends
    /// or zstd cannot load them.
    pub(crate) fn new(bytes: &[u8]) -> Option<Learned> {
        if bytes.is_empty() || bytes.len() > MAX_DICTIONARY_BYTES {
            return None;
        }
        zstd_safe::DDict::try_create(bytes).map(Learned)
    }
}

/// A payload as one slice: itself, or its two parts joined.
fn contiguous<'a>(payload: &[&'a [u8]]) -> std::borrow::Cow<'a, [u8]> {
    match payload {
        [one] => std::borrow::Cow::Borrowed(*one),
        parts => std::borrow::Cow::Owned(parts.concat()),
    }
}

/// Most zstd compression contexts (one per level) a thread keeps.
const MAX_ZSTD_LEVELS: usize = 4;

thread_local! {
    /// zstd contexts of this thread, by level (making one costs more than
    /// compressing a small payload).
    static ZSTD: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(Vec::new()) };
    static UNZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    /// Contexts for dictionaries: each call names its prepared dictionary
    /// (none is kept attached to the context between calls).
    static CZSTD: RefCell<Option<zstd_safe::CCtx<'static>>> = const { RefCell::new(None) };
    static UNZSTD_DICT: RefCell<Option<zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

/// Why a compressed body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InflateError {
    /// Its head says it inflates beyond what a message may hold.
    #[error("it would inflate to {size} bytes, over max_message_bytes ({limit})")]
    TooLarge {
        /// What its head says.
        size: usize,
        /// `max_message_bytes`.
        limit: usize,
    },
    /// The data do not inflate, or not to the size its head says.
    #[error("its {0} data do not inflate to the size its head says")]
    Corrupt(&'static str),
}

/// Inflates a compressed body read by [`Compressed::read`], refusing one
/// that would pass `limit` bytes before inflating anything.
#[cfg(test)]
pub(crate) fn inflate(c: &Compressed<'_>, limit: usize) -> Result<Vec<u8>, InflateError> {
    let mut out = Vec::new();
    inflate_with(c, None, limit, &mut out)?;
    Ok(out)
}

/// Inflates a compressed body onto the end of `out` (which grows by
/// exactly its size), refusing one that would pass `limit` bytes, or that
/// LZ4 could not have made from its data, before allocating anything.
/// `dict` is the dictionary the body names (a body that names one
/// inflates only with it).
pub(crate) fn inflate_with(
    c: &Compressed<'_>,
    dict: Option<&Learned>,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), InflateError> {
    if c.size > limit {
        return Err(InflateError::TooLarge {
            size: c.size,
            limit,
        });
    }
    let name = match c.compressor {
        Compressor::Lz4 => "LZ4",
        Compressor::Zstd => "zstd",
    };
    // LZ4 expands at most 255 times (and a few bytes): a head that says
    // more lies, and would make every such frame allocate its size.
    if c.compressor == Compressor::Lz4 && c.size > c.data.len().saturating_mul(255) + 16 {
        return Err(InflateError::Corrupt(name));
    }
    let at = out.len();
    out.resize(at + c.size, 0);
    let dst = &mut out[at..];
    let got = match c.compressor {
        Compressor::Lz4 => {
            let size = i32::try_from(c.size).map_err(|_| InflateError::Corrupt(name))?;
            lz4::block::decompress_to_buffer(c.data, Some(size), dst).ok()
        }
        Compressor::Zstd => match (c.dictionary, dict) {
            (None, _) => UNZSTD.with(|z| {
                let mut z = z.borrow_mut();
                if z.is_none() {
                    *z = zstd::bulk::Decompressor::new().ok();
                }
                z.as_mut()?.decompress_to_buffer(c.data, dst).ok()
            }),
            (Some(_), Some(d)) => UNZSTD_DICT.with(|z| {
                let mut z = z.borrow_mut();
                let cx = z.get_or_insert_with(zstd_safe::DCtx::create);
                cx.decompress_using_ddict(dst, c.data, &d.0).ok()
            }),
            (Some(_), None) => None,
        },
    };
    if got != Some(c.size) {
        out.truncate(at);
        return Err(InflateError::Corrupt(name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"beam current 12.5 mA; "[i % 22]).collect()
    }

    #[test]
    fn a_payload_deflates_and_inflates_back_with_each_compressor() {
        for c in [
            Compression::lz4(),
            Compression::zstd(),
            Compression::zstd().level(19),
        ] {
            let p = text(10_000);
            let body = c.deflate(&[&p[..4000], &p[4000..]]).expect("shrinks");
            assert!(body.len() < p.len() / 5, "{}: {}", c.name(), body.len());
            let read = Compressed::read(&body).unwrap();
            assert_eq!(read.size, p.len());
            assert_eq!(inflate(&read, 1 << 20).unwrap(), p);
        }
    }

    #[test]
    fn small_or_incompressible_payloads_and_no_compressor_go_as_they_are() {
        assert!(Compression::zstd().deflate(&[&text(100)]).is_none());
        assert!(Compression::zstd()
            .threshold(10)
            .deflate(&[&text(100)])
            .is_some());
        let mut x: u32 = 1;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            })
            .collect();
        assert!(Compression::lz4().deflate(&[&noise]).is_none());
        assert!(Compression::none().deflate(&[&text(10_000)]).is_none());
    }

    #[test]
    fn a_bomb_a_lie_about_the_size_and_corrupt_data_are_refused() {
        let p = text(100_000);
        for c in [Compression::lz4(), Compression::zstd()] {
            let body = c.deflate(&[&p]).unwrap();
            let read = Compressed::read(&body).unwrap();
            // Over the limit: refused before inflating.
            assert_eq!(
                inflate(&read, 50_000),
                Err(InflateError::TooLarge {
                    size: 100_000,
                    limit: 50_000
                })
            );
            // A head that says less than the data hold.
            let mut small = body.clone();
            small[1..5].copy_from_slice(&1000u32.to_le_bytes());
            assert!(inflate(&Compressed::read(&small).unwrap(), 1 << 20).is_err());
            // A head that says more.
            let mut big = body.clone();
            big[1..5].copy_from_slice(&200_000u32.to_le_bytes());
            assert!(inflate(&Compressed::read(&big).unwrap(), 1 << 20).is_err());
            // Flipped bytes in the data: an error or other bytes, never
            // more than the size (a wider mutation run: below).
            for i in (COMPRESSED_HEAD_LEN..body.len()).step_by(7) {
                let mut bad = body.clone();
                bad[i] ^= 0x5a;
                if let Ok(out) = inflate(&Compressed::read(&bad).unwrap(), 1 << 20) {
                    assert_eq!(out.len(), 100_000);
                }
            }
        }
    }

    /// A dictionary trained from 128 samples alike, and the subscriber's
    /// copy of it.
    fn trained_dictionary() -> (Dictionary, Learned) {
        let d = Dictionary::default();
        let zd = Compression::zstd().dictionary().threshold(8);
        let mut trained = None;
        for i in 0..DICTIONARY_TRAINING_SAMPLES {
            let p = format!("beam {i}: current 12.{i} mA, vacuum 1e-9 mbar, state ON");
            if let (_, Some(t)) = d.deflate(&zd, &[p.as_bytes()]) {
                trained = Some(t);
            }
        }
        let t = trained.expect("trained at the 128th sample");
        assert_eq!(milonga_wire::content_id(&t.bytes), t.id);
        let learned = Learned::new(&t.bytes).expect("it loads");
        (d, learned)
    }

    fn inflate_with_dictionary(
        c: &Compressed<'_>,
        d: &Learned,
        limit: usize,
    ) -> Result<Vec<u8>, InflateError> {
        let mut out = Vec::new();
        inflate_with(c, c.dictionary.map(|_| d), limit, &mut out)?;
        Ok(out)
    }

    #[test]
    fn a_trained_dictionary_shrinks_small_payloads_and_inflates_only_with_it() {
        let (dict, learned) = trained_dictionary();
        let zd = Compression::zstd().dictionary().threshold(8);
        let p = b"beam 7: current 12.7 mA, vacuum 1e-9 mbar, state ON";
        let body = dict.deflate(&zd, &[p]).0.expect("it shrinks");
        // Plain zstd cannot shrink a payload this small; with the
        // dictionary it takes (with its 9-byte head) under two thirds.
        assert!(Compression::zstd().threshold(8).deflate(&[p]).is_none());
        assert!(
            body.len() < p.len() * 2 / 3,
            "{} of {}",
            body.len(),
            p.len()
        );
        let c = Compressed::read(&body).unwrap();
        assert!(c.dictionary.is_some());
        assert_eq!(inflate_with_dictionary(&c, &learned, 1 << 20).unwrap(), p);
        // Without the dictionary it does not inflate; a dictionary that
        // is too large or empty is not loaded.
        assert!(inflate(&c, 1 << 20).is_err());
        assert!(Learned::new(&[]).is_none());
        assert!(Learned::new(&vec![7; MAX_DICTIONARY_BYTES + 1]).is_none());
        // Below the threshold, or another compressor: no dictionary.
        assert!(dict.deflate(&zd.threshold(1000), &[p]).0.is_none());
    }

    /// Mutations of compressed bodies (bytes changed, inserted, cut,
    /// heads rewritten) never panic and never inflate past the limit.
    #[test]
    fn mutated_compressed_bodies_never_panic_nor_grow_past_the_limit() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let limit = 1 << 16;
        let mut seeds: Vec<Vec<u8>> = [Compression::lz4(), Compression::zstd()]
            .iter()
            .flat_map(|c| {
                [text(600), text(20_000)]
                    .into_iter()
                    .map(|p| c.deflate(&[&p]).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        // And bodies made with a dictionary, inflated with it.
        let (dict, learned) = trained_dictionary();
        let zd = Compression::zstd().dictionary().threshold(8);
        for p in [text(100), text(3000)] {
            seeds.push(dict.deflate(&zd, &[&p]).0.expect("it shrinks"));
        }
        let mut refused = 0;
        for i in 0..40_000 {
            let mut b = seeds[i % seeds.len()].clone();
            for _ in 0..1 + next(4) {
                match next(4) {
                    0 if !b.is_empty() => {
                        let at = next(b.len());
                        b[at] = next(256) as u8;
                    }
                    0 => {}
                    1 => {
                        let at = next(b.len() + 1);
                        b.insert(at, next(256) as u8);
                    }
                    2 => b.truncate(next(b.len() + 1)),
                    _ => {
                        if b.len() >= COMPRESSED_HEAD_LEN {
                            let size = next(limit * 2) as u32;
                            b[1..5].copy_from_slice(&size.to_le_bytes());
                        }
                    }
                }
            }
            match Compressed::read(&b) {
                Err(_) => refused += 1,
                Ok(c) => match inflate_with_dictionary(&c, &learned, limit) {
                    Ok(out) => assert!(out.len() == c.size && out.len() <= limit),
                    Err(_) => refused += 1,
                },
            }
        }
        assert!(refused > 10_000, "most mutations are refused: {refused}");
    }
}
