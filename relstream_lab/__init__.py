"""relstream's lab: the paper's benchmarks, the drills, their reports and the policies only
the simulator runs. The product (`relstream`) never imports it; the lab imports the product.
Importing it registers the lab's policies in the product's policy registry."""
