//! A short, deterministic fuzz run on stable Rust, part of every test run:
//! the golden vectors and 200,000 mutations of them (bit flips, byte
//! changes, truncations, extensions) through the frame and payload decoders.
//! The coverage-guided fuzzer is fuzz/ (cargo-fuzz, nightly; docs/fuzzing.md).

use milonga_wire::cbor::decode_payload;
use milonga_wire::frame::{decode, BatchEntries, Kind};
use milonga_wire::Bytes;

fn run(f1: &[u8], f2: Option<&[u8]>) {
    let Ok(view) = decode(f1) else { return };
    match view.header.kind {
        Kind::Reply => {
            if let Some(status) = view.body.first() {
                if *status != 0 {
                    let _ = milonga_wire::service::Failure::decode(&view.body[1..]);
                }
            }
        }
        Kind::History => {
            let _ = milonga_wire::history::Reply::decode(&Bytes::copy_from_slice(view.body));
        }
        Kind::Sample | Kind::Heartbeat | Kind::Request => {
            let _ = decode_payload(
                view.header.encoding,
                Bytes::copy_from_slice(view.body),
                f2.map(Bytes::copy_from_slice),
            );
        }
        Kind::Batch => {
            for e in BatchEntries::new(view.body).into_iter().flatten().flatten() {
                let _ = decode_payload(
                    view.header.encoding,
                    Bytes::copy_from_slice(e.payload),
                    None,
                );
            }
        }
    }
}

#[test]
fn mutations_of_the_vectors_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty());
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..200_000 {
        let mut f = seeds[i % seeds.len()].clone();
        match rnd() % 5 {
            0 => {
                let n = f.len().max(1);
                let bit = (rnd() % (n as u64 * 8)) as usize;
                if let Some(b) = f.get_mut(bit / 8) {
                    *b ^= 1 << (bit % 8);
                }
            }
            1 => {
                let n = f.len().max(1);
                let at = (rnd() % n as u64) as usize;
                if let Some(b) = f.get_mut(at) {
                    *b = rnd() as u8;
                }
            }
            2 => f.truncate((rnd() % (f.len() as u64 + 1)) as usize),
            3 => f.extend((0..rnd() % 64).map(|_| rnd() as u8)),
            _ => f = (0..rnd() % 200).map(|_| rnd() as u8).collect(),
        }
        let cut = (rnd() % (f.len() as u64 + 1)) as usize;
        run(&f, None);
        run(&f[..cut], Some(&f[cut..]));
    }
}
