//! placeholder
pub mod api_error;
pub mod apply;
pub mod patch;
pub mod resources;
pub mod selector;
pub mod store;
pub mod validation;
