//! What every stage of one pipeline shares: in, the engine's model facts and the treatment
//! (from `wire`); out, the buffer pools, the queue depth and the one context each stage
//! borrows what it reads from.

use std::sync::Arc;

use crate::budget::Budget;
use crate::frame::Pool;
use crate::treatment::Treatment;

/// Frames in flight between two stages.
pub(crate) const DEPTH: usize = 4;

/// Buffer pools sized to what can be in flight, so a buffer is never dropped and reallocated
/// (a fresh 1080p RGB buffer costs page faults on every first touch).
pub(crate) struct Pools {
    pub(crate) rgb: Pool<Vec<u8>>,
    pub(crate) det: Pool<Vec<u8>>,
    pub(crate) crop: Pool<Vec<u8>>,
    pub(crate) restored: Pool<Vec<i16>>,
    /// The paste's change buffers, from paste to encode (sizes of face regions, not crops).
    pub(crate) change: Pool<Vec<f32>>,
    /// Half-resolution luma of the crops, from alignment to the temporal filter.
    pub(crate) luma: Pool<Vec<f32>>,
    /// A video's frames in flight (see [`Budget`]); none for a stream of pictures.
    pub(crate) budget: Option<Arc<Budget>>,
}

impl Pools {
    /// Pools for `frames` frames in flight and `crops` crops.
    pub(crate) fn new(frames: usize, crops: usize) -> Self {
        Self {
            rgb: Pool::new(frames),
            det: Pool::new(frames),
            crop: Pool::new(crops),
            restored: Pool::new(crops),
            change: Pool::new(frames),
            luma: Pool::new(crops),
            budget: None,
        }
    }
}

/// What every stage of one pipeline reads: the treatment, the model's crop side and template
/// points, the pools and the width of the pool stages.
pub(crate) struct StageCtx<'a> {
    pub(crate) treatment: &'a Treatment,
    /// The model's crop side.
    pub(crate) size: usize,
    /// The model's alignment template scaled to the crop.
    pub(crate) template: [[f32; 2]; 5],
    pub(crate) pools: &'a Pools,
    /// Threads of each pool stage (alignment, paste).
    pub(crate) threads: usize,
    /// Whether the temporal filter runs (alignment then keeps each crop's luma for it).
    pub(crate) temporal: bool,
    /// The crops stay with their faces after the model (the identity stage reads them and
    /// gives them back to their pool).
    pub(crate) keep_crops: bool,
    /// Whether a smoother links the faces into tracks after the mesh (a video): the mesh then
    /// leaves the faces it doubts to their track (see [`crate::defaults::SUPPORT_SCORE`]).
    pub(crate) tracked: bool,
    /// Where a side-by-side view puts its pictures (the source's display turn and mirror).
    pub(crate) sides: crate::media::compare::Sides,
    /// The CPU level every stage's kernels run at (the engine's, decided by the settings).
    pub(crate) cpu: crate::kernels::Cpu,
}
