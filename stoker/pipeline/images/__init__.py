"""Images: the crop-window JPEG decoder and its restart-marker transcoder (C), the augmentations, the
batch of decoded images and its layout, corrupt-JPEG handling, and the photos a default dataset is made of."""
