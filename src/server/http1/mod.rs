//! The proxy's own HTTP/1.1 server side, in place of hyper's: lean by design, since
//! every idle keep-alive connection costs what it holds. An idle connection holds its
//! socket, its task and one timer, and no buffer; a request costs one read buffer, its
//! header map, and one `writev` for its answer's head (with the first frame of the body
//! when that is ready). The request body reads itself from the socket, in the
//! connection's task, when its reader polls it: no channel, no task of its own.
//!
//! Files follow the connection: [`conn`] (the phases), [`head`] (parse and limits),
//! [`request_body`] (its framing decoded), [`response`] (the answer's head and framing),
//! [`upgrade`] (the socket handed over after a 101), [`io`] (the socket as they share it).

pub mod conn;
pub mod head;
mod io;
pub mod request_body;
mod response;
pub mod upgrade;

pub use request_body::RequestBody;
