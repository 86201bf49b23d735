//! Parse -> check -> expand, each a plain function over `proc_macro2` types.

pub mod attr;
pub mod check;
pub mod derive;
pub mod expand;
pub mod handler;
pub mod serde_names;
