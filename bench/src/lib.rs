//! kubegrace benchmark harness.
