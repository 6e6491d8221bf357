//! The RAII lease the blocking gate hands out.

use std::fmt;

use crate::core::{Admission, LeaseToken};
use crate::shared::Shared;
use crate::sync::Arc;
use crate::{Reason, TurnReport};

/// Permission for one turn of a session to run on the engine.
///
/// Hold it for as long as the engine works on the request; releasing it
/// (explicitly with [`Lease::release`], or by dropping it) is what lets the
/// next waiter in, and what turns a retained session's reservation into its
/// idle grace window. Release as soon as the engine call returns or fails,
/// before post-processing the output. A lease stays valid after the gate is
/// closed, and keeps the gate's state alive until released.
#[must_use = "dropping a lease releases it at once"]
pub struct Lease {
    shared: Arc<Shared>,
    token: Option<LeaseToken>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease").field("token", &self.token).finish()
    }
}

impl Lease {
    pub(crate) fn new(shared: Arc<Shared>, token: LeaseToken) -> Self {
        Self {
            shared,
            token: Some(token),
        }
    }

    fn token(&self) -> &LeaseToken {
        self.token.as_ref().expect("a live lease holds its token")
    }

    /// What the admission looked like: reason, wait, probe answers.
    pub fn admission(&self) -> &Admission {
        self.token().admission()
    }

    /// Why the turn was admitted.
    pub fn reason(&self) -> Reason {
        self.admission().reason
    }

    /// The session the lease belongs to.
    pub fn session_id(&self) -> &[u8] {
        self.token().session_id()
    }

    /// Releases the lease now. Dropping it does the same; consuming `self`
    /// makes a second release impossible.
    pub fn release(mut self) {
        self.release_now();
    }

    /// Releases the lease now with what the engine reported of the turn
    /// (its cached prompt tokens, vLLM's `num_cached_tokens`, and its
    /// output): working-set admission learns from it. Plain
    /// [`Lease::release`] (or a drop) reports nothing, which is always valid.
    pub fn release_with(mut self, report: TurnReport) {
        if let Some(token) = self.token.take() {
            self.shared.release(token, report);
        }
    }

    fn release_now(&mut self) {
        if let Some(token) = self.token.take() {
            self.shared.release(token, TurnReport::default());
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_now();
    }
}
