//! Wire formats, one API call each: JSON patches of pods ([`pod`]) and of ResourceClaims'
//! finalizer ([`claim`]), the server-side apply of a GpuQueue's status ([`queue_status`]) and
//! the Event queue ([`events`]).

pub mod claim;
pub mod events;
pub mod pod;
pub mod queue_status;
