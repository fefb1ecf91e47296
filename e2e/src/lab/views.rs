//! What the daemons say about the VIP: a swimlb speaker's `/status`, a MetalLB speaker's
//! metrics and memberlist, a keepalived's VRRP state; the values convergence is judged on.

/// One swimlb speaker's `/status`, as far as the VIP goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerView {
    /// The owner it names for the VIP (`None`: no owner, or the VIP missing).
    pub owner: Option<String>,
    /// Alive members it sees, itself included.
    pub members: usize,
    /// Whether it says it has joined the mesh.
    pub ready: bool,
}

/// One MetalLB speaker, as far as the VIP goes: MetalLB has no status endpoint, so the lab
/// reads what it exposes, its `/metrics` (`metallb_speaker_announced` for the VIP, set only
/// on the node that announces it) and its log (memberlist's join and leave events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetallbView {
    /// Whether this speaker announces the VIP.
    pub announces: bool,
    /// Members of its memberlist, itself included, as its log's node events leave them.
    pub members: usize,
}

/// A keepalived VRRP state, as its notify FIFO last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VrrpState {
    /// Holds the VIP.
    Master,
    /// Listens for the master's adverts.
    Backup,
    /// Its interface or a tracked script is down.
    Fault,
    /// Stopping.
    Stop,
    /// Anything else keepalived may write.
    Unknown(String),
}

impl VrrpState {
    /// Reads the state word of a notify line (`MASTER`, `BACKUP`, ...); never fails.
    pub fn parse(word: &str) -> VrrpState {
        match word {
            "MASTER" => VrrpState::Master,
            "BACKUP" => VrrpState::Backup,
            "FAULT" => VrrpState::Fault,
            "STOP" => VrrpState::Stop,
            other => VrrpState::Unknown(other.to_string()),
        }
    }
}

/// What every node's daemon says, in node order (index 0 is node 1); `None`: it said nothing
/// (no `/status` answer, no VRRP state reported since it started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Views {
    /// swimlb speakers.
    Swimlb(Vec<Option<SpeakerView>>),
    /// keepalived instances.
    Keepalived(Vec<Option<VrrpState>>),
    /// MetalLB speakers.
    Metallb(Vec<Option<MetallbView>>),
}
