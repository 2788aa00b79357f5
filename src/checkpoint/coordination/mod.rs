//! How compactions are coordinated, in one process and across replicas: one summariser
//! call per conversation at a time (`flight`, leases in the shared store), and the
//! compactions prepared ahead in the background with their fates (`prepared`). They sit
//! beside the stores because the stores' front (`Checkpoints`) runs its work through them.

pub mod flight;
pub mod prepared;
