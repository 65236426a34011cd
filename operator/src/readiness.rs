//! What `/readyz` of the operator says: ready once the controller runs with its caches filled, or while
//! this replica stands by for leadership; not ready while starting nor once shutdown began.
//!
//! A standby replica counts as ready: it is healthy and takes over within a lease duration, and a
//! rolling update of the operator (new pod surged while the old one leads) would otherwise never finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where the operator process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControllerState {
    /// Started; the controller's caches are not filled yet.
    Starting = 0,
    /// Waiting for leadership (`--leader-elect`) while another replica leads.
    Standby = 1,
    /// The controller runs and has listed every watched resource.
    Running = 2,
    /// Shutdown began (signal or leadership lost): the controller is stopping.
    Stopping = 3,
}

impl ControllerState {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => Self::Starting,
            1 => Self::Standby,
            2 => Self::Running,
            _ => Self::Stopping,
        }
    }
}

/// The controller's state, shared by the controller, `main` and the `/readyz` handler.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicU8>);

impl Readiness {
    /// The state now.
    pub fn state(&self) -> ControllerState {
        ControllerState::from_u8(self.0.load(Ordering::SeqCst))
    }

    /// True when `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        matches!(self.state(), ControllerState::Standby | ControllerState::Running)
    }

    /// Moves to `state`, except out of `Stopping`, which is final.
    pub fn set(&self, state: ControllerState) {
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
            (ControllerState::from_u8(current) != ControllerState::Stopping).then_some(state as u8)
        });
    }

    /// Shutdown began: not ready from now on.
    pub fn stopping(&self) {
        self.0.store(ControllerState::Stopping as u8, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_while_running_or_standing_by_and_never_again_once_stopping() {
        let readiness = Readiness::default();
        assert_eq!(readiness.state(), ControllerState::Starting);
        assert!(!readiness.is_ready(), "not ready before the caches are filled");
        readiness.set(ControllerState::Standby);
        assert!(readiness.is_ready());
        readiness.set(ControllerState::Running);
        assert!(readiness.is_ready());
        readiness.stopping();
        assert!(!readiness.is_ready());
        readiness.set(ControllerState::Running);
        assert_eq!(readiness.state(), ControllerState::Stopping, "a late cache sync cannot undo a shutdown");
    }
}
