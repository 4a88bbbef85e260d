pub mod checkpoint;
