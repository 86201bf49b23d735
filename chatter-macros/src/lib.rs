//! chatter
