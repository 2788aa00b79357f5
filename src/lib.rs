pub mod compact;
pub mod offline;
