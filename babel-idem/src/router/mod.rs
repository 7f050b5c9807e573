//! Handler registration by URN and dispatch of raw deliveries.
