//! Python bindings (written next).
