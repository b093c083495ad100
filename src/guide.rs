//! The guide: each entry point at length, with its promises and its limits.
//!
//! (Written below, section by section.)
