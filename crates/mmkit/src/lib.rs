pub use mmkit_core;
