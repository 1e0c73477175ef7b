//! The protocol's state, with no I/O of its own: sequence numbers and
//! gaps, the application queue, kept history, filters applied at the
//! source, batches. Frames go in and out; the sockets are the backend's.

pub(crate) mod batch;
pub(crate) mod filters;
pub(crate) mod history;
pub(crate) mod queue;
pub(crate) mod seq;
