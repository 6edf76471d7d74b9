//! What the kernels run on: the rayon thread pool they share ([`threads`]) and the
//! machine probes (memory bandwidth, peak FLOP/s) that calibrate the rooflines ([`probe`]),
//! timed by the wall clock or by their threads' CPU time ([`clock`]).

pub mod clock;
pub mod probe;
pub mod threads;
