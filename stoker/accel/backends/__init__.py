"""The training-step backends a rank runs: the built-in ones (null, simulated, torch), BERT and
ResNet-50 models with their large-batch optimizers, and the calibrated rates of named systems.
They implement stoker.accel.stepping's contracts; the rank's runtime never imports them."""
