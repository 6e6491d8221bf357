//! The doorbell's twin under loom (`src/sync/doorbell.rs` is the real
//! one): a flag, since a model cannot poll a file descriptor. What the
//! models check is whether the bell is rung when a tag waits to be drained.

use super::{AtomicBool, Ordering};

#[derive(Debug)]
pub(crate) struct Doorbell {
    rung: AtomicBool,
}

impl Doorbell {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            rung: AtomicBool::new(false),
        })
    }

    pub(crate) fn fd(&self) -> i32 {
        -1
    }

    pub(crate) fn ring(&self) {
        self.rung.store(true, Ordering::SeqCst);
    }

    pub(crate) fn clear(&self) {
        self.rung.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_rung(&self) -> bool {
        self.rung.load(Ordering::SeqCst)
    }
}
