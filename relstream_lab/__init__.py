"""relstream's lab: the paper's benchmarks, the drills, their reports, the paper's baseline
policies and the policies only the simulator runs. The product (`relstream`) never imports
it; the lab imports the product. Importing it registers the baselines in the product's
policy registry."""

from relstream_lab.baselines import register

register()
