-- The calibration of token estimates, per model family (the registry entry an estimated
-- model matched): its recent observations of estimated against reported input tokens, as
-- JSON. Bounded: a fixed window per family.
CREATE TABLE model_calibrations (
    model TEXT PRIMARY KEY,
    calibration TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
