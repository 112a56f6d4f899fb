"""Every public op with default arguments: ``PUBLIC[name](x, **kwargs)`` (shared by the test files)."""

import torchfilters as tf

PUBLIC = {
    "correlate": lambda x, **k: tf.correlate(x, [[1.0, 2.0, 1.0]], **k),
    "convolve": lambda x, **k: tf.convolve(x, [[1.0], [2.0]], **k),
    "correlate1d": lambda x, **k: tf.correlate1d(x, [1.0, 2.0], **k),
    "convolve1d": lambda x, **k: tf.convolve1d(x, [1.0, 2.0, 3.0], -2, **k),
    "uniform_filter": lambda x, **k: tf.uniform_filter(x, **k),
    "uniform_filter1d": lambda x, **k: tf.uniform_filter1d(x, 3, -2, **k),
    "derivative": lambda x, **k: tf.derivative(x, **k),
    "gradient": lambda x, **k: tf.gradient(x, **k),
    "gradient_magnitude": lambda x, **k: tf.gradient_magnitude(x, **k),
    "gradient_direction": lambda x, **k: tf.gradient_direction(x, **k),
    "sobel": lambda x, **k: tf.sobel(x, **k),
    "prewitt": lambda x, **k: tf.prewitt(x, **k),
    "scharr": lambda x, **k: tf.scharr(x, **k),
    "laplace": lambda x, **k: tf.laplace(x, **k),
    "gaussian_filter": lambda x, **k: tf.gaussian_filter(x, 1.0, **k),
    "gaussian_filter1d": lambda x, **k: tf.gaussian_filter1d(x, 1.0, -2, **k),
    "gaussian_gradient_magnitude": lambda x, **k: tf.gaussian_gradient_magnitude(x, 1.0, **k),
    "gaussian_laplace": lambda x, **k: tf.gaussian_laplace(x, 1.0, **k),
    "selective_blur": lambda x, **k: tf.selective_blur(x, 0.5, **k),
    "median_filter": lambda x, **k: tf.median_filter(x, 3, **k),
    "minimum_filter": lambda x, **k: tf.minimum_filter(x, (2, 3), **k),
    "maximum_filter": lambda x, **k: tf.maximum_filter(x, footprint=[[1, 0, 1], [0, 1, 1]], **k),
    "rank_filter": lambda x, **k: tf.rank_filter(x, 2, 3, **k),
    "percentile_filter": lambda x, **k: tf.percentile_filter(x, 30.0, (3, 2), **k),
    "minimum_filter1d": lambda x, **k: tf.minimum_filter1d(x, 3, -2, **k),
    "maximum_filter1d": lambda x, **k: tf.maximum_filter1d(x, 4, **k),
    "unsharp_mask": lambda x, **k: tf.unsharp_mask(x, 1.0, 0.7, **k),
    "difference_of_gaussians": lambda x, **k: tf.difference_of_gaussians(x, 0.8, **k),
}
#: the ops whose default call filters 2 axes (the 1-D ones filter one: any input of >= 1 dims)
TWO_AXES = sorted(n for n in PUBLIC if not n.endswith("1d"))
