"""What the lab's experiments share: the paper's trace, simulator runs, report files."""
