//! Wire formats, one API call each: JSON patches of pods ([`pod`]), the server-side apply of a
//! GpuQueue's status ([`queue_status`]) and the Event queue ([`events`]).

pub mod events;
pub mod pod;
pub mod queue_status;
