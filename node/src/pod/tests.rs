//! Pod worker tests with paused time and the fake runtime.
