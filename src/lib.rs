pub mod classify;
pub mod models;
