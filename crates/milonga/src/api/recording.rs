//! Recordings: what subscriptions received, in MCAP files that
//! `milonga record` writes and `milonga cat`, `info` and `replay` read, as
//! do MCAP's own tools (docs/recording.md has the format mapping).
//!
//! ```no_run
//! use milonga::recording::{RecordOptions, RecordReader, RecordWriter, Entry};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = milonga::Node::open("milonga:///lab", "recorder")?;
//! let sub = node.subscribe("beam/**")?;
//! let path = std::path::Path::new("run.mcap");
//! let mut w = RecordWriter::create(path, &RecordOptions::default())?;
//! for _ in 0..100 {
//!     if let milonga::Event::Sample(s) = sub.recv()? {
//!         w.sample(&s, s.timestamp_ns)?;
//!     }
//! }
//! w.finish()?;
//! for entry in RecordReader::open(path)? {
//!     if let Entry::Sample(s, _received) = entry? {
//!         println!("{} {} {:?}", s.key, s.seq, s.value);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub use crate::backend::file::{
    copy_recording, status_from_json, status_json, Compression, Entry, RecordError, RecordOptions,
    RecordReader, RecordWriter, Skipped, EVENTS_TOPIC, METADATA_LIMIT, METADATA_NAME,
    META_ENCODING, META_PUBLISHER, META_REPLAYED, META_SEQ_HIGH, RECORD_LIMIT,
};

/// The recording writer's own I/O habits (blocks allocated ahead,
/// writeback started as it goes), for a baseline that writes as it does
/// (`milonga bench record`'s disk rate). Not part of the API.
#[doc(hidden)]
pub mod io {
    pub use crate::util::sys::{preallocate, start_writeback};
}
