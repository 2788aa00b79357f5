//! The seam of the places the windows and token-count calibration learned from the
//! upstream are kept, so that a restart, or another replica, starts from them: the
//! embedded file ([`super::embedded`]) and Redis ([`super::redis`]). Not secret, so never
//! sealed: an operator may read them.

use super::store::StoreFuture;
use crate::model_record::ModelRecord;

pub trait WindowStore: Send + Sync {
    /// Every model learned so far, to start from.
    fn models(&self) -> StoreFuture<'_, Vec<ModelRecord>>;

    /// Keeps what was learned of one model: only the fields it has, so that replicas
    /// sharing the store do not overwrite each other's others.
    fn put_model(&self, record: ModelRecord) -> StoreFuture<'_, ()>;

    /// Forgets every model learned.
    fn clear_models(&self) -> StoreFuture<'_, ()>;
}
