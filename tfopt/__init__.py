"""tfopt: train TensorFlow models under any tf.distribute strategy and ship them to the edge."""
__version__ = "0.1.0"
