"""The stress cases, one module per case (or per pair of cases sharing one measurement)."""
