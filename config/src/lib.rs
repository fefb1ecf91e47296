//! swimlb configuration: the standalone file, the CRD types, and their validation.
