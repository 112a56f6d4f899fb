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
}
#: the ops whose default call filters 2 axes (the 1-D ones filter one: any input of >= 1 dims)
TWO_AXES = sorted(n for n in PUBLIC if not n.endswith("1d"))
