//! What an upstream's answer to a chat request means.
