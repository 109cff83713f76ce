"""The runtime side of NRI: plugins, event dispatch, merging and validation of adjustments."""
