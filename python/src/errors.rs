//! Milonga's errors as the exceptions of `milonga.errors`.

use milonga::{
    CallError, OpenError, PublisherError, PutError, RecvError, ServeError, SubscribeError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `class` (in `milonga.errors`) with `message`.
pub(crate) fn raise(py: Python<'_>, class: &str, message: impl Into<String>) -> PyErr {
    raise_with(py, class, message, &[])
}

/// The same, with attributes set on the exception.
pub(crate) fn raise_with(
    py: Python<'_>,
    class: &str,
    message: impl Into<String>,
    attrs: &[(&str, Py<PyAny>)],
) -> PyErr {
    let message = message.into();
    let built = (|| -> PyResult<PyErr> {
        let module =
            ERRORS.get_or_try_init(py, || py.import("milonga.errors").map(Bound::unbind))?;
        let exc = module.bind(py).getattr(class)?.call1((message.clone(),))?;
        for (k, v) in attrs {
            exc.setattr(*k, v.bind(py))?;
        }
        Ok(PyErr::from_value(exc))
    })();
    built.unwrap_or_else(|e| e)
}

fn s(py: Python<'_>, v: &str) -> Py<PyAny> {
    pyo3::types::PyString::new(py, v).into_any().unbind()
}

pub(crate) fn open(py: Python<'_>, e: OpenError) -> PyErr {
    let class = match &e {
        OpenError::BadLocator { .. } | OpenError::Unsupported { .. } | OpenError::Config { .. } => {
            "ConfigError"
        }
        _ => "OpenError",
    };
    raise(py, class, e.to_string())
}

pub(crate) fn publisher(py: Python<'_>, e: PublisherError) -> PyErr {
    match e {
        PublisherError::Key(k) => raise(py, "InvalidKey", k.to_string()),
        PublisherError::AlreadyDeclared(_) => raise(py, "AlreadyDeclared", e.to_string()),
        PublisherError::Open(o) => open(py, o),
        PublisherError::Closed => raise(py, "Closed", e.to_string()),
        PublisherError::Schema(_) => raise(py, "ConfigError", e.to_string()),
        other => raise(py, "Error", other.to_string()),
    }
}

pub(crate) fn subscribe(py: Python<'_>, e: SubscribeError) -> PyErr {
    match e {
        SubscribeError::Key(k) => raise(py, "InvalidKey", k.to_string()),
        SubscribeError::Open(o) => open(py, o),
        SubscribeError::Closed => raise(py, "Closed", e.to_string()),
        SubscribeError::Qos(_) | SubscribeError::Filter(_) => {
            raise(py, "ConfigError", e.to_string())
        }
        SubscribeError::Recording(_) => raise(py, "OpenError", e.to_string()),
        other => raise(py, "Error", other.to_string()),
    }
}

pub(crate) fn put(py: Python<'_>, e: PutError) -> PyErr {
    let class = match &e {
        PutError::Encode(_) | PutError::Schema(_) => "EncodeError",
        PutError::TooLarge { .. } => "TooLarge",
        PutError::WouldBlock => "WouldBlock",
        PutError::Timeout(_) => "TimeoutError",
        PutError::Closed => "Closed",
        _ => "Error",
    };
    raise(py, class, e.to_string())
}

pub(crate) fn recv(py: Python<'_>, e: RecvError) -> PyErr {
    let class = match &e {
        RecvError::Timeout => "TimeoutError",
        // Iteration ends there, as at a closed node.
        RecvError::Closed | RecvError::EndOfRecording => "Closed",
        _ => "Error",
    };
    raise(py, class, e.to_string())
}

pub(crate) fn serve(py: Python<'_>, e: ServeError) -> PyErr {
    match e {
        ServeError::Key(k) => raise(py, "InvalidKey", k.to_string()),
        ServeError::AlreadyServed(_) => raise(py, "AlreadyDeclared", e.to_string()),
        ServeError::Options(_) => raise(py, "ConfigError", e.to_string()),
        ServeError::Open(o) => open(py, o),
        ServeError::Closed => raise(py, "Closed", e.to_string()),
        other => raise(py, "Error", other.to_string()),
    }
}

pub(crate) fn call(py: Python<'_>, e: CallError) -> PyErr {
    let msg = e.to_string();
    match e {
        CallError::Key(_) => raise(py, "InvalidKey", msg),
        CallError::Encode(_) => raise(py, "EncodeError", msg),
        CallError::NoServer { key } => raise_with(py, "NoServer", msg, &[("key", s(py, &key))]),
        CallError::Timeout { key, server, .. } => raise_with(
            py,
            "TimeoutError",
            msg,
            &[("key", s(py, &key)), ("server", s(py, &server))],
        ),
        CallError::Remote {
            server,
            kind,
            message,
        } => raise_with(
            py,
            "RemoteError",
            msg,
            &[
                ("server", s(py, &server)),
                ("kind", s(py, &kind)),
                ("remote_message", s(py, &message)),
            ],
        ),
        CallError::ServerLost { server } => {
            raise_with(py, "ServerLost", msg, &[("server", s(py, &server))])
        }
        CallError::Rejected { server, kind, .. } => {
            let server = server.map_or_else(|| py.None(), |x| s(py, &x));
            raise_with(
                py,
                "Rejected",
                msg,
                &[("server", server), ("kind", s(py, &kind))],
            )
        }
        CallError::PermissionDenied { server, .. } => {
            raise_with(py, "CallDenied", msg, &[("server", s(py, &server))])
        }
        CallError::BadReply { server, .. } => {
            raise_with(py, "BadReply", msg, &[("server", s(py, &server))])
        }
        CallError::Open(o) => open(py, o),
        CallError::Closed => raise(py, "Closed", msg),
        _ => raise(py, "Error", msg),
    }
}
